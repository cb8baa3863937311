package deps

import (
	_ "github.com/edsrzf/mmap-go"
	_ "github.com/stretchr/testify/require"
	_ "golang.org/x/sys/unix"
	_ "gorgonia.org/tensor"
	_ "go4.org/unsafe/assume-no-moving-gc"
	_ "gonum.org/v1/plot"
)
