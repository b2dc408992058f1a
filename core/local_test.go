package core_test

import (
	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/transport/local"
)

func localTransport() core.Transport { return local.New() }
