package etcd

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tent-dev/tent/status"
)

// grpcCode extracts the gRPC code of an etcd client error.
func grpcCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if s, ok := grpcstatus.FromError(err); ok {
		return s.Code()
	}
	return codes.Unknown
}

// wrapErr turns an etcd client error into a tent error: no answer within
// the time allowed is Timeout, an unreachable or failing etcd is
// TransportError. what says what was being done; within is the time that
// was allowed.
func (d *Directory) wrapErr(err error, within time.Duration, what string) error {
	if err == nil {
		return nil
	}
	eps := strings.Join(d.cfg.endpoints, ",")
	switch {
	case errors.Is(err, context.DeadlineExceeded) || grpcCode(err) == codes.DeadlineExceeded:
		return status.Errorf(status.Timeout, "etcd: %s: no answer from etcd at %s within %v (is it running and reachable?)",
			what, eps, within.Round(time.Millisecond))
	case errors.Is(err, context.Canceled) || grpcCode(err) == codes.Canceled:
		return status.Errorf(status.Closed, "etcd: %s: canceled (engine closing)", what)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return status.Errorf(status.InvalidArgument, "etcd: %s: request too large for etcd at %s: %w", what, eps, err)
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), grpcCode(err) == codes.Unauthenticated,
		grpcCode(err) == codes.PermissionDenied:
		return status.Errorf(status.AuthFailed, "etcd: %s: etcd at %s refused access: %w", what, eps, err)
	default:
		return status.Errorf(status.TransportError, "etcd: %s: etcd at %s: %w", what, eps, err)
	}
}
