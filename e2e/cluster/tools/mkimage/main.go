// mkimage writes a container image tarball (the `docker save` format, which
// `ctr images import` reads) from layer tarballs and a few config fields,
// using go-containerregistry to produce the manifest, config and digests.
//
//	mkimage --ref REF --out FILE.tar --layer L.tar [--layer ...]
//	        [--entrypoint JSON|PATH] [--cmd JSON|ARG] [--env K=V]... [--user U] [--workdir D]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// argv accepts a JSON array (["/bin/sh","-c","..."]) or a single word.
func argv(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if strings.HasPrefix(strings.TrimSpace(s), "[") {
		var out []string
		return out, json.Unmarshal([]byte(s), &out)
	}
	return []string{s}, nil
}

func main() {
	var layers, env multi
	ref := flag.String("ref", "", "image reference, e.g. docker.io/nextmini/tools:dev")
	out := flag.String("out", "", "output tarball")
	entrypoint := flag.String("entrypoint", "", "entrypoint: JSON array or one path")
	cmd := flag.String("cmd", "", "cmd: JSON array or one word")
	user := flag.String("user", "", "user (uid[:gid])")
	workdir := flag.String("workdir", "", "working directory")
	flag.Var(&layers, "layer", "layer tarball (repeatable, applied in order)")
	flag.Var(&env, "env", "K=V (repeatable)")
	flag.Parse()
	if err := run(*ref, *out, layers, env, *entrypoint, *cmd, *user, *workdir); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(ref, out string, layers, env []string, entrypoint, cmd, user, workdir string) error {
	if ref == "" || out == "" {
		return fmt.Errorf("--ref and --out are required")
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	img := empty.Image
	for _, path := range layers {
		l, err := tarball.LayerFromFile(path, tarball.WithCompressionLevel(1))
		if err != nil {
			return fmt.Errorf("layer %s: %w", path, err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	if cf.Config.Entrypoint, err = argv(entrypoint); err != nil {
		return fmt.Errorf("--entrypoint: %w", err)
	}
	if cf.Config.Cmd, err = argv(cmd); err != nil {
		return fmt.Errorf("--cmd: %w", err)
	}
	cf.Config.Env = env
	hasPath := false
	for _, e := range env {
		hasPath = hasPath || strings.HasPrefix(e, "PATH=")
	}
	if !hasPath {
		cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"}, env...)
	}
	cf.Config.User = user
	cf.Config.WorkingDir = workdir
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	return tarball.WriteToFile(out, tag, img)
}
