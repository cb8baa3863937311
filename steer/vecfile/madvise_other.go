//go:build !unix

package vecfile

// dontNeed is a no-op where there is no madvise: the pages go when the mapping is unmapped.
func dontNeed([]byte) {}
