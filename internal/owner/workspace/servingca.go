package workspace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/orrery-dev/orrery/internal/records/servingca"
)

// KubeletServingCAFile holds the kubelet-serving CA's pair while a cluster
// made before that CA moves to it: every control plane must get the same
// pair, and a move cut short goes on with the one the first control
// planes took. It goes once every control plane has moved; the join
// service hands it to the control planes that join later.
const KubeletServingCAFile = "orrery-kubelet-serving-ca.json" //nolint:gosec // a file name, not a secret

type servingCAPair struct {
	Certificate string `json:"certificate"`
	Key         string `json:"key"`
}

// KubeletServingCA returns the pair kept for a move to the kubelet-serving
// CA, and makes and keeps one (0600) if there is none.
func (d Dir) KubeletServingCA(now time.Time) (certPEM, keyPEM []byte, err error) {
	data, err := d.ReadFile(KubeletServingCAFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if certPEM, keyPEM, err = servingca.New(now); err != nil {
			return nil, nil, fmt.Errorf("make the kubelet-serving CA: %w", err)
		}
		data, err := json.Marshal(servingCAPair{Certificate: string(certPEM), Key: string(keyPEM)})
		if err != nil {
			return nil, nil, err
		}
		if err := d.replace(KubeletServingCAFile, data); err != nil {
			return nil, nil, err
		}
		return certPEM, keyPEM, nil
	case err != nil:
		return nil, nil, err
	}
	var p servingCAPair
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, nil, fmt.Errorf("%s is not a kubelet-serving CA pair (%w); remove it only if no control plane took it yet", d.Path(KubeletServingCAFile), err)
	}
	if err := servingca.Check([]byte(p.Certificate), []byte(p.Key), now); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", d.Path(KubeletServingCAFile), err)
	}
	return []byte(p.Certificate), []byte(p.Key), nil
}

// RemoveKubeletServingCA removes the pair kept for a move, once it is done.
func (d Dir) RemoveKubeletServingCA() error {
	if err := os.Remove(d.Path(KubeletServingCAFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
