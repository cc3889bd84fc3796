// Package controlplanes is the format of the owner's list of approved
// control planes: the instance IDs (see attestation.Instance) of the VMs
// the join service may hand the cluster's CA keys, kept under Key in the
// join service's ConfigMap. The first control plane writes the list at
// init (bootstrapperd), the owner adds to it ('orrery control-plane
// approve'), and the join service reads it on every request.
package controlplanes

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
)

// Where the list lives.
const (
	Namespace     = "kube-system"
	ConfigMapName = "orrery-join-config"
	Key           = "controlPlaneInstanceIDs"
)

// PKIFiles are the files, relative to kubeadm's certificate directory,
// that the join service hands an approved control plane and the only ones
// its join client writes: kubeadm's shared set (the cluster, front-proxy
// and etcd CAs and the service-account key pair), from which `kubeadm
// join --control-plane` makes every certificate of its own, and the
// kubelet-serving CA, with which its controller manager signs kubelets'
// serving certificates. Nothing the node can make itself, and nothing of
// another node, is in it.
var PKIFiles = append(slices.Clone(KubeletServingCAFiles),
	"ca.crt", "ca.key", "sa.key", "sa.pub",
	"front-proxy-ca.crt", "front-proxy-ca.key",
	"etcd/ca.crt", "etcd/ca.key",
)

// KubeletServingCAFiles are the kubelet-serving CA's pair, which a
// cluster made before that CA does not have: its control planes sign
// kubelets' serving certificates with the cluster CA, and a joining one
// gets that configuration from the cluster too.
var KubeletServingCAFiles = []string{"kubelet-serving-ca.crt", "kubelet-serving-ca.key"}

// MaxIDs bounds the list.
const MaxIDs = 1000

// Parse reads the list: IDs separated by white space or commas; a '#'
// starts a comment that runs to the end of its line. An ID that the
// platform could not have issued (see platformca.CheckInstanceID) is an
// error, so that a typo is found when the list is read, not taken for an
// ID that matches nobody.
func Parse(text string) ([]string, error) {
	var ids []string
	for line := range strings.Lines(text) {
		line, _, _ = strings.Cut(line, "#")
		for _, id := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
			if err := platformca.CheckInstanceID(id); err != nil {
				return nil, fmt.Errorf("%s: %w", Key, err)
			}
			if len(ids) == MaxIDs {
				return nil, fmt.Errorf("%s: more than %d instance IDs", Key, MaxIDs)
			}
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// Approve returns text with id added on a line of its own, and whether it
// was missing. The list must parse, and id must be a valid instance ID.
func Approve(text, id string) (string, bool, error) {
	if err := platformca.CheckInstanceID(id); err != nil {
		return "", false, err
	}
	ids, err := Parse(text)
	if err != nil {
		return "", false, err
	}
	if slices.Contains(ids, id) {
		return text, false, nil
	}
	if len(ids) == MaxIDs {
		return "", false, fmt.Errorf("%s: already %d instance IDs", Key, MaxIDs)
	}
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return text + id + "\n", true, nil
}

// Revoke returns text without id, and whether it was there. Comments and
// the other IDs stay; a line left empty goes. The list must parse, and id
// must be a valid instance ID.
func Revoke(text, id string) (string, bool, error) {
	if err := platformca.CheckInstanceID(id); err != nil {
		return "", false, err
	}
	ids, err := Parse(text)
	if err != nil {
		return "", false, err
	}
	if !slices.Contains(ids, id) {
		return text, false, nil
	}
	var out strings.Builder
	for line := range strings.Lines(text) {
		list, comment, hasComment := strings.Cut(strings.TrimRight(line, "\n"), "#")
		kept := slices.DeleteFunc(strings.FieldsFunc(list, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }), func(s string) bool { return s == id })
		if len(kept) == 0 && !hasComment {
			continue
		}
		out.WriteString(strings.Join(kept, " "))
		if hasComment {
			if len(kept) > 0 {
				out.WriteString(" ")
			}
			out.WriteString("#" + comment)
		}
		out.WriteString("\n")
	}
	return out.String(), true, nil
}
