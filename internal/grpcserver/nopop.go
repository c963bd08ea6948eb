//go:build !flowdpop

package grpcserver

import pb "github.com/flowd-io/flowd/internal/rocketmqv2"

func popStatus(error) *pb.Status { return nil }

func (s *Server) fifoGroup(string) bool { return false }
