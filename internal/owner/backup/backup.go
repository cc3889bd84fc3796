// Package backup saves custom resource definitions and every custom
// resource of them as YAML files on the owner's disk, so that an upgrade
// that changes or drops a CRD (and with it the cluster's objects of that
// kind) loses nothing the owner cannot put back with kubectl.
//
// A backup is a folder:
//
//	crds/<crd name>.yaml
//	resources/<crd name>/<namespace or _cluster>/<name>.yaml
//
// one object per file, stripped of what the API server assigns (UID,
// resource version, managed fields, status), so that
//
//	kubectl apply -f crds/ && kubectl apply -R -f resources/
//
// restores it. The folder is written under a temporary name and renamed
// when complete: a folder with the final name is a whole backup. Before
// anything is written, Save checks that the disk can hold it.
package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// crdResource is the API of CustomResourceDefinitions.
var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// pageSize bounds one list request: a kind with many objects is read in
// pages rather than in one answer the API server must build in memory.
const pageSize = 500

// Result says what a backup holds.
type Result struct {
	// Dir is the backup's folder.
	Dir string
	// CRDs and Resources count the objects saved.
	CRDs, Resources int
	// Bytes is the size of the files written.
	Bytes int64
}

// ErrNoSpace means the disk cannot hold the backup; nothing was written.
var ErrNoSpace = errors.New("not enough free space for the backup")

// Save saves the CRDs named crds (CustomResourceDefinition names, such as
// "measurementsets.orrery.dev") and all their custom resources into dir,
// which must not exist yet. A CRD that does not exist is skipped: there is
// nothing of it to lose.
func Save(ctx context.Context, client dynamic.Interface, crds []string, dir string) (Result, error) {
	res := Result{Dir: dir}
	if _, err := os.Lstat(dir); err == nil {
		return res, fmt.Errorf("backup folder %s exists already; choose another", dir)
	}
	files := map[string][]byte{} // relative path -> content
	for _, name := range crds {
		crd, err := client.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("read CRD %s: %w", name, err)
		}
		gvr, namespaced, err := servedResource(crd)
		if err != nil {
			return res, fmt.Errorf("CRD %s: %w", name, err)
		}
		b, err := manifest(crd)
		if err != nil {
			return res, fmt.Errorf("CRD %s: %w", name, err)
		}
		files[filepath.Join("crds", fileName(name))] = b
		res.CRDs++
		n, err := saveResources(ctx, client.Resource(gvr), name, namespaced, files)
		if err != nil {
			return res, err
		}
		res.Resources += n
	}
	for _, b := range files {
		res.Bytes += int64(len(b))
	}
	if err := checkSpace(filepath.Dir(dir), res.Bytes); err != nil {
		return res, err
	}
	return res, writeAll(dir, files)
}

// servedResource is the resource of crd's storage version, and whether
// its objects are namespaced.
func servedResource(crd *unstructured.Unstructured) (schema.GroupVersionResource, bool, error) {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	scope, _, _ := unstructured.NestedString(crd.Object, "spec", "scope")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		if storage, _ := m["storage"].(bool); storage {
			name, _ := m["name"].(string)
			if group == "" || plural == "" || name == "" {
				break
			}
			return schema.GroupVersionResource{Group: group, Version: name, Resource: plural}, scope == "Namespaced", nil
		}
	}
	return schema.GroupVersionResource{}, false, errors.New("it names no group, plural or storage version")
}

// saveResources renders every object of one CRD into files and returns
// how many there were.
func saveResources(ctx context.Context, r dynamic.NamespaceableResourceInterface, crd string, namespaced bool, files map[string][]byte) (int, error) {
	n := 0
	opts := metav1.ListOptions{Limit: pageSize}
	for {
		list, err := r.List(ctx, opts)
		if err != nil {
			return n, fmt.Errorf("list the objects of CRD %s: %w", crd, err)
		}
		for i := range list.Items {
			obj := &list.Items[i]
			ns := "_cluster"
			if namespaced {
				ns = obj.GetNamespace()
			}
			b, err := manifest(obj)
			if err != nil {
				return n, fmt.Errorf("%s %s/%s: %w", crd, ns, obj.GetName(), err)
			}
			files[filepath.Join("resources", escape(crd), escape(ns), fileName(obj.GetName()))] = b
			n++
		}
		if list.GetContinue() == "" {
			return n, nil
		}
		opts.Continue = list.GetContinue()
	}
}

// manifest is obj as YAML without what the API server assigns, so that
// 'kubectl apply' takes it again, in this cluster or a new one.
func manifest(obj *unstructured.Unstructured) ([]byte, error) {
	o := obj.DeepCopy()
	for _, f := range []string{"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink"} {
		unstructured.RemoveNestedField(o.Object, "metadata", f)
	}
	unstructured.RemoveNestedField(o.Object, "status")
	// kubectl apply's own record of the last applied object would
	// make a restore compare against a stale copy.
	annotations := o.GetAnnotations()
	delete(annotations, "kubectl.kubernetes.io/last-applied-configuration")
	if len(annotations) == 0 {
		annotations = nil
	}
	o.SetAnnotations(annotations)
	return yaml.Marshal(o.Object)
}

// fileName is the file of the object called name.
func fileName(name string) string { return escape(name) + ".yaml" }

// escape makes a Kubernetes name (DNS labels and subdomains, so
// [a-z0-9.-]) a path element; anything else an API server let through is
// escaped rather than trusted with a path.
func escape(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.' && b.Len() > 0:
			b.WriteRune(r)
		default:
			fmt.Fprintf(&b, "%%%02x", r)
		}
	}
	return b.String()
}

// checkSpace refuses a backup of need bytes that the file system of dir
// cannot hold with room to spare.
func checkSpace(dir string, need int64) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	free, err := freeSpace(dir)
	if err != nil {
		return fmt.Errorf("free space on %s: %w", dir, err)
	}
	// Files take whole blocks, and the disk must not end up full.
	want := need + need/4 + 4<<20
	if free < want {
		return fmt.Errorf("%w in %s: it needs %d KiB, %d KiB are free", ErrNoSpace, dir, want>>10, free>>10)
	}
	return nil
}

// freeSpace is the space an unprivileged writer has left on dir's file
// system; tests replace it.
var freeSpace = func(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// writeAll writes files under a temporary folder beside dir, then renames
// it to dir.
func writeAll(dir string, files map[string][]byte) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".partial-")
	if err != nil {
		return fmt.Errorf("create the backup folder: %w", err)
	}
	for rel, b := range files {
		p := filepath.Join(tmp, rel)
		err := os.MkdirAll(filepath.Dir(p), 0o700)
		if err == nil {
			err = os.WriteFile(p, b, 0o600)
		}
		if err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("write the backup: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("complete the backup: %w", err)
	}
	return nil
}
