package main

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The kinds our manifests may contain, as the Go types of the pinned API versions (go.mod).
// Any other kind is an error: a typo in apiVersion or kind must not pass unchecked.
var kinds = map[string]func() any{
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                            func() any { return &batchv1.Job{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// document is one decoded object and where it came from, for error messages.
type document struct {
	where  string
	object any
}

func decodeFiles(names []string, out io.Writer) error {
	var docs []document
	for _, name := range names {
		data, err := readInput(name)
		if err != nil {
			return err
		}
		found, err := decodeAll(name, data)
		if err != nil {
			return err
		}
		docs = append(docs, found...)
	}
	if len(docs) == 0 {
		return fmt.Errorf("no objects in %s", strings.Join(names, ", "))
	}
	if err := check(docs); err != nil {
		return err
	}
	objects := make([]any, len(docs))
	for i, d := range docs {
		objects[i] = d.object
	}
	return json.NewEncoder(out).Encode(objects)
}

// decodeAll decodes every non-empty document of a multi-document YAML stream strictly: an
// unknown or duplicated field is an error, as it is for `kubectl apply --validate=strict`.
func decodeAll(name string, data []byte) ([]document, error) {
	var docs []document
	for i, part := range separator.Split(string(data), -1) {
		if isBlank(part) {
			continue
		}
		where := fmt.Sprintf("%s, document %d", name, i+1)
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(part), &meta); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		key := meta.APIVersion + "/" + meta.Kind
		newObject, ok := kinds[key]
		if !ok {
			return nil, fmt.Errorf("%s: unknown kind %q", where, key)
		}
		object := newObject()
		if err := yaml.UnmarshalStrict([]byte(part), object); err != nil {
			return nil, fmt.Errorf("%s (%s): %w", where, key, err)
		}
		docs = append(docs, document{where: fmt.Sprintf("%s (%s %s)", where, meta.Kind, nameOf(object)), object: object})
	}
	return docs, nil
}

// isBlank: only comments and white space, as Helm leaves for a template that renders nothing.
func isBlank(part string) bool {
	for _, line := range strings.Split(part, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

func nameOf(object any) string {
	if m, ok := object.(metav1.ObjectMetaAccessor); ok {
		return m.GetObjectMeta().GetName()
	}
	return "?"
}
