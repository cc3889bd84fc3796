package snp

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/orrery-dev/orrery/internal/strictjson"
)

// The policy's decoders are strict (package strictjson): the section
// decides which nodes get the cluster's secrets.

// UnmarshalJSON reads a policy strictly; ParsePolicy also validates it.
func (p *Policy) UnmarshalJSON(data []byte) error {
	var got Policy
	_, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"measurement":          strictjson.New(&got.Measurement),
		"gceLaunchEndorsement": strictjson.New(&got.GCELaunchEndorsement),
		"guestPolicy":          strictjson.New(&got.GuestPolicy),
		"minimumTcb":           strictjson.New(&got.MinimumTCB),
		"chipIds":              strictjson.New(&got.ChipIDs),
		"minimumReportVersion": strictjson.New(&got.MinimumReportVersion),
		"testRoot":             strictjson.New(&got.TestRoot),
	})
	if err != nil {
		return err
	}
	*p = got
	return nil
}

// UnmarshalJSON reads the accepted guest policy.
func (g *GuestPolicy) UnmarshalJSON(data []byte) error {
	var got GuestPolicy
	_, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"allowSmt":            strictjson.Bool(&got.AllowSMT),
		"allowMigrationAgent": strictjson.Bool(&got.AllowMigrationAgent),
		"warnOnly":            strictjson.Bool(&got.WarnOnly),
	})
	if err != nil {
		return err
	}
	*g = got
	return nil
}

// UnmarshalJSON reads a minimum TCB; every component must be given.
func (t *TCB) UnmarshalJSON(data []byte) error {
	var got TCB
	seen, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"bootloader": strictjson.Uint8(&got.Bootloader),
		"tee":        strictjson.Uint8(&got.TEE),
		"snp":        strictjson.Uint8(&got.SNP),
		"microcode":  strictjson.Uint8(&got.Microcode),
		"warnOnly":   strictjson.Bool(&got.WarnOnly),
	})
	if err == nil {
		err = strictjson.Required(seen, "bootloader", "tee", "snp", "microcode")
	}
	if err != nil {
		return err
	}
	*t = got
	return nil
}

// UnmarshalJSON reads {"allowed": ["<hex>", ...], "warnOnly": bool}.
func (c *ChipIDs) UnmarshalJSON(data []byte) error {
	var got ChipIDs
	seen, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"allowed": func(raw json.RawMessage) error {
			var ids []string
			if json.Unmarshal(raw, &ids) != nil {
				return errors.New("must be a list of hex strings")
			}
			for i, s := range ids {
				b, err := hex.DecodeString(s)
				if err != nil {
					return fmt.Errorf("[%d] is not hex: %w", i, err)
				}
				got.Allowed = append(got.Allowed, b)
			}
			return nil
		},
		"warnOnly": strictjson.Bool(&got.WarnOnly),
	})
	if err == nil {
		err = strictjson.Required(seen, "allowed")
	}
	if err != nil {
		return err
	}
	*c = got
	return nil
}

// UnmarshalJSON reads a test root; notARealCpu, ark and ask must be
// given (Validate checks that notARealCpu is true).
func (r *TestRoot) UnmarshalJSON(data []byte) error {
	var got TestRoot
	seen, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"notARealCpu": strictjson.Bool(&got.NotARealCPU),
		"ark":         strictjson.String(&got.ARK),
		"ask":         strictjson.String(&got.ASK),
		"crl":         strictjson.String(&got.CRL),
	})
	if err == nil {
		err = strictjson.Required(seen, "notARealCpu", "ark", "ask")
	}
	if err != nil {
		return err
	}
	*r = got
	return nil
}
