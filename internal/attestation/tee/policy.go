package tee

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/orrery-dev/orrery/internal/strictjson"
)

// The hardware variants' policy sections share these values. Their
// decoders are strict (package strictjson): a policy decides which nodes
// get the cluster's secrets.

// Expected is a value a report must show exactly. Its JSON form is
// {"expected": "<hex>", "warnOnly": false}; warnOnly's zero value
// enforces.
type Expected struct {
	Expected []byte
	WarnOnly bool
}

// MarshalJSON writes the expected value as lowercase hex.
func (e Expected) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Expected string `json:"expected"`
		WarnOnly bool   `json:"warnOnly,omitempty"`
	}{hex.EncodeToString(e.Expected), e.WarnOnly})
}

// UnmarshalJSON reads {"expected": "<hex>", "warnOnly": bool} strictly.
func (e *Expected) UnmarshalJSON(data []byte) error {
	var got Expected
	seen, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"expected": strictjson.Hex(&got.Expected),
		"warnOnly": strictjson.Bool(&got.WarnOnly),
	})
	if err == nil {
		err = strictjson.Required(seen, "expected")
	}
	if err != nil {
		return err
	}
	*e = got
	return nil
}

// MinimumVersion is a lowest accepted version number: {"minimum": n,
// "warnOnly": false}. A variant whose field is narrower checks the
// bound in its policy's Validate.
type MinimumVersion struct {
	Minimum  uint32 `json:"minimum"`
	WarnOnly bool   `json:"warnOnly,omitempty"`
}

// UnmarshalJSON reads {"minimum": n, "warnOnly": bool} strictly.
func (m *MinimumVersion) UnmarshalJSON(data []byte) error {
	var got MinimumVersion
	seen, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"minimum":  strictjson.Uint32(&got.Minimum),
		"warnOnly": strictjson.Bool(&got.WarnOnly),
	})
	if err == nil {
		err = strictjson.Required(seen, "minimum")
	}
	if err != nil {
		return err
	}
	*m = got
	return nil
}

// MaxCollateralFile bounds what is read of one file of an owner's
// collateral cache: the vendors' largest responses (a CRL, Intel's TCB
// info) are tens of kilobytes.
const MaxCollateralFile = 1 << 20

// ReadCollateralFile reads one file of an owner's collateral cache,
// refusing one larger than MaxCollateralFile: the cache is the owner's,
// but a file there may have come from anywhere.
func ReadCollateralFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxCollateralFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > MaxCollateralFile {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a response of the CPU vendor's service", path, MaxCollateralFile)
	}
	return b, nil
}
