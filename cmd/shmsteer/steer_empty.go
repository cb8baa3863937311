package main

import "github.com/shmsteer/shmsteer/steer"

func steerEmpty() steer.Steering { return steer.Steering{} }
