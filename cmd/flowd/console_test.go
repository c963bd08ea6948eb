package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/flowd-io/flowd/config"
)

func TestHTTPListenOffLoopbackNeedsCredentials(t *testing.T) {
	c := config.Default()
	assert.NoError(t, checkHTTPAuth(c), "the loopback default")
	c.HTTP.Listen = "0.0.0.0:8080"
	assert.True(t, errors.Is(checkHTTPAuth(c), errInsecureHTTP))
	c.NATS.Token = "t"
	assert.NoError(t, checkHTTPAuth(c))
	c.NATS.Token = ""
	c.NATS.Users = []config.User{{Name: "a", Password: "b", Role: "read"}}
	assert.NoError(t, checkHTTPAuth(c))
	c.NATS.Users = nil
	c.HTTP.Listen = "off"
	assert.NoError(t, checkHTTPAuth(c))
	c.HTTP.Listen = "localhost:0"
	assert.NoError(t, checkHTTPAuth(c))
}
