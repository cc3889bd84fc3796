package initserver

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/orrery-dev/orrery/internal/clustersettings"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// Limits of an InitRequest beyond the cluster's settings (package
// clustersettings, whose limits are repeated here for the tests).
const (
	// maxInitSecret is bcrypt's input limit.
	maxInitSecret = 72

	maxClusterName = clustersettings.MaxClusterName
	maxSAN         = clustersettings.MaxSAN
	maxSANs        = clustersettings.MaxSANs
	maxVersion     = clustersettings.MaxVersion
	maxServiceCIDR = clustersettings.MaxServiceCIDR

	// MaxRequestSize bounds an InitRequest on the wire, for the gRPC
	// server's MaxRecvMsgSize: a request with every field at its limit
	// is under 17 KiB; the rest is room for fields to come.
	MaxRequestSize = 32 << 10
)

// validate checks everything about a request that needs no outside
// information, before anything on the node is touched; the init secret
// is checked before, by checkInitSecret. Each error says which field is
// wrong and how, and stays small whatever the request holds.
func validate(req *initpb.InitRequest, supported func(string) error) error {
	var errs []error
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	if err := ms.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("master secret: %w", err))
	}
	if n := len(req.GetMeasurementSalt()); n != keys.SaltSize {
		errs = append(errs, fmt.Errorf("measurement salt has %d bytes, want %d", n, keys.SaltSize))
	} else if bytes.Equal(req.GetMeasurementSalt(), req.GetMasterSecretSalt()) {
		errs = append(errs, errors.New("measurement salt equals the master secret salt: it must be generated separately"))
	}
	settings := clustersettings.Settings{
		KubernetesVersion: req.GetKubernetesVersion(),
		ClusterName:       req.GetClusterName(),
		APIServerSANs:     req.GetApiServerCertSans(),
		ServiceCIDR:       req.GetServiceCidr(),

		ControlPlaneEndpoint: req.GetControlPlaneEndpoint(),
	}
	if err := settings.Validate(supported); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
