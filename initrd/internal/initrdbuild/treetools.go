package initrdbuild

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/u-root/mkuimage/cpio"
)

// libDirs are where the tree's dynamic loader finds libraries without a
// cache, in its order (its "system search path").
var libDirs = []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib", "lib64", "usr/lib64"}

// maxLinks bounds the symbolic links followed for one path.
const maxLinks = 40

// treeFiles returns the tools, the libraries they load (the dynamic loader
// included) and the configuration files, as the OS tree at root has them:
// each path the initrd gets (relative, as the tree names it) to the file
// in the tree that holds its bytes. The image's initrd takes them from
// the tree, whose packages image/packages/packages.lock pins, and not
// from the build host, whose versions are its own.
func treeFiles(root string) (map[string]string, error) {
	out := map[string]string{}
	for _, t := range configFiles {
		src, err := inTree(root, t)
		if err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(t, "/")] = src
	}
	for _, t := range Tools {
		if err := addELF(root, strings.TrimPrefix(t, "/"), out); err != nil {
			return nil, fmt.Errorf("%s of the OS tree: %w", t, err)
		}
	}
	return out, nil
}

// addELF adds the program or library rel (a path in the tree), its
// interpreter and every library it needs, to out.
func addELF(root, rel string, out map[string]string) error {
	if _, ok := out[rel]; ok {
		return nil
	}
	src, err := inTree(root, "/"+rel)
	if err != nil {
		return err
	}
	out[rel] = src
	f, err := elf.Open(src)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return fmt.Errorf("%s's interpreter: %w", rel, err)
		}
		if err := addELF(root, strings.TrimPrefix(strings.TrimRight(string(b), "\x00"), "/"), out); err != nil {
			return err
		}
	}
	needed, err := f.DynString(elf.DT_NEEDED)
	if err != nil {
		return fmt.Errorf("%s's libraries: %w", rel, err)
	}
	for _, lib := range needed {
		found := ""
		for _, d := range libDirs {
			if _, err := inTree(root, "/"+d+"/"+lib); err == nil {
				found = d + "/" + lib
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s needs %s, which the tree does not have in %s", rel, lib, strings.Join(libDirs, ", "))
		}
		if err := addELF(root, found, out); err != nil {
			return err
		}
	}
	return nil
}

// inTree resolves the absolute path p inside the tree at root, following
// its symbolic links (absolute ones from root, never out of it), and
// returns the host path of the regular file it leads to.
func inTree(root, p string) (string, error) {
	cur := "/"
	rest := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
	for links := 0; len(rest) > 0; {
		name := rest[0]
		rest = rest[1:]
		next := path.Join(cur, name)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: too many symbolic links", p)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		rest = append(strings.Split(strings.Trim(path.Clean(target), "/"), "/"), rest...)
		cur = "/"
	}
	host := filepath.Join(root, cur)
	fi, err := os.Stat(host)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file in the tree", p)
	}
	return host, nil
}

// addTreeTools writes the files of treeFiles(root) into base.
func addTreeTools(base *cpio.Archive, root string) error {
	files, err := treeFiles(root)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return errors.New("no tools in the tree")
	}
	for _, rel := range slices.Sorted(maps.Keys(files)) {
		b, err := os.ReadFile(files[rel])
		if err != nil {
			return err
		}
		fi, err := os.Stat(files[rel])
		if err != nil {
			return err
		}
		if err := base.WriteRecord(cpio.StaticRecord(b, cpio.Info{Name: rel, Mode: cpio.S_IFREG | uint64(fi.Mode().Perm())})); err != nil {
			return fmt.Errorf("add %s: %w", rel, err)
		}
	}
	return nil
}
