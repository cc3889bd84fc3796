package strictjson

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// KubernetesYAML decodes the YAML (or JSON) data into v as Kubernetes'
// own programs decode their files (client-go a kubeconfig, kubelet a
// static pod): through JSON, member names matching exactly. A checker
// that decoded with encoding/json's folding of names would read
// "Server", or "ſerver" (a long s, which folds to s), where kubelet reads
// only "server": a file could show the checker one value and kubelet
// another. A member name that is not ASCII is refused outright, since no
// Kubernetes field has one.
func KubernetesYAML(data []byte, v any) error {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	var tree any
	if err := json.Unmarshal(j, &tree); err != nil {
		return err
	}
	if err := asciiNames(tree, ""); err != nil {
		return err
	}
	return kjson.UnmarshalCaseSensitivePreserveInts(j, v)
}

func asciiNames(v any, path string) error {
	switch v := v.(type) {
	case map[string]any:
		for k, m := range v {
			for _, r := range k {
				if r >= utf8.RuneSelf {
					return fmt.Errorf("member %q%s is not ASCII", k, at(path))
				}
			}
			if err := asciiNames(m, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		for i, m := range v {
			if err := asciiNames(m, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func at(path string) string {
	if path == "" {
		return ""
	}
	return " in " + strings.TrimPrefix(path, ".")
}
