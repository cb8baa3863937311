package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOnePrefix(t *testing.T) {
	inner := errors.New("shmsteer: bad steering config")
	outer := errors.New("shmsteer: bad serve configuration")
	err := fmt.Errorf("%w: %w: hidden size 0 not in [1, 1048576]", outer, inner)
	require.Equal(t, "shmsteer: bad serve configuration: bad steering config: hidden size 0 not in [1, 1048576]", oneprefix(err))
	require.Equal(t, "shmsteer: open x: no such file", oneprefix(errors.New("open x: no such file")))
}
