package main

import (
	"io"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// kustomize builds a kustomization as `kustomize build DIR` does, so the plain manifests are
// proven kustomize-ready without a kustomize or kubectl binary on the machine.
func kustomize(dir string, out io.Writer) error {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return err
	}
	yaml, err := resources.AsYaml()
	if err != nil {
		return err
	}
	_, err = out.Write(yaml)
	return err
}
