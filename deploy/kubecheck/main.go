// Command kubecheck checks Kubernetes manifests offline, the way an API server of a pinned
// version would read them, plus the mistakes an API server accepts but that break a deployment
// silently (a selector that matches no pod, a probe on a port that is not declared, an
// environment reference to a variable defined later).
//
//	kubecheck decode FILE...      strict-decode every document ("-" reads stdin); print them as JSON
//	kubecheck kustomize DIR       build a kustomization and print the result as YAML
//	kubecheck values-table FILE   the Markdown table of a Helm values file's "# --" comments
//	kubecheck yaml2json FILE      any YAML document as JSON
//
// tests/kubernetes.rs drives it; scripts/kube-tools builds it.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 3 {
		fail(fmt.Errorf("usage: kubecheck decode|kustomize|values-table|yaml2json ARG..."))
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "decode":
		err = decodeFiles(args, os.Stdout)
	case "kustomize":
		err = kustomize(args[0], os.Stdout)
	case "values-table":
		err = valuesTable(args[0], os.Stdout)
	case "yaml2json":
		err = yamlToJSON(args[0], os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kubecheck:", err)
	os.Exit(1)
}

func readInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

func yamlToJSON(name string, out io.Writer) error {
	data, err := readInput(name)
	if err != nil {
		return err
	}
	var doc any
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return json.NewEncoder(out).Encode(doc)
}
