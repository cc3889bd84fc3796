package kubeupgradepb

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The reasons RemoveEtcdMember gives with a refusal (google.rpc.ErrorInfo),
// so that the owner's CLI knows what to suggest without reading the
// message.
const (
	// ReasonQuorum: the removal leaves etcd without a quorum of healthy
	// voting members; the request's break_quorum overrides it.
	ReasonQuorum = "ETCD_QUORUM"
	// ReasonAskAnother: this control plane cannot remove that member
	// (it is its own, or it runs no etcd); another control plane may.
	ReasonAskAnother = "ASK_ANOTHER_CONTROL_PLANE"
)

const errorDomain = "orrery.dev"

// Refusal is a status error with code, a message, and reason attached.
func Refusal(code codes.Code, reason, format string, args ...any) error {
	st := status.New(code, fmt.Sprintf(format, args...))
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// Reason is the reason a Refusal in err's chain gives, or "".
func Reason(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return ""
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return info.GetReason()
		}
	}
	return ""
}
