package proto

// WireNames is wireNames, for the external tests (wire_test.go).
func WireNames() map[Code]string { return wireNames }
