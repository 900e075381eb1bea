package main

import (
	"errors"
	"fmt"
	"regexp"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// pod is a pod template and the workload that owns it.
type pod struct {
	owner    string
	labels   map[string]string
	spec     corev1.PodSpec
	selector *metav1.LabelSelector
}

// check finds what decoding cannot: names the API server refuses, and references between
// objects (selectors, named ports, environment variables) that point at nothing.
func check(docs []document) error {
	var errs []error
	report := func(where string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
	}
	var pods []pod
	for _, d := range docs {
		if m, ok := d.object.(metav1.ObjectMetaAccessor); ok {
			meta := m.GetObjectMeta()
			for _, msg := range validation.IsDNS1123Subdomain(meta.GetName()) {
				report(d.where, "name: %s", msg)
			}
			for k, v := range meta.GetLabels() {
				for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
					report(d.where, "label %s: %s", k, msg)
				}
			}
		}
		switch o := d.object.(type) {
		case *appsv1.Deployment:
			pods = append(pods, pod{d.where, o.Spec.Template.Labels, o.Spec.Template.Spec, o.Spec.Selector})
		case *batchv1.Job:
			pods = append(pods, pod{d.where, o.Spec.Template.Labels, o.Spec.Template.Spec, nil})
			if p := o.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever && p != corev1.RestartPolicyOnFailure {
				report(d.where, "a Job's restartPolicy must be Never or OnFailure, not %q", p)
			}
		}
	}
	for _, p := range pods {
		if p.selector != nil && !matches(p.selector, p.labels) {
			report(p.owner, "the selector does not match the pod template's labels")
		}
		for _, msg := range checkPodSpec(p.spec) {
			report(p.owner, "%s", msg)
		}
	}
	for _, d := range docs {
		switch o := d.object.(type) {
		case *policyv1.PodDisruptionBudget:
			if len(selected(pods, o.Spec.Selector)) == 0 {
				report(d.where, "the selector matches no pod template")
			}
		case *corev1.Service:
			chosen := selected(pods, &metav1.LabelSelector{MatchLabels: o.Spec.Selector})
			if len(chosen) == 0 {
				report(d.where, "the selector matches no pod template")
			}
			for _, port := range o.Spec.Ports {
				if name := port.TargetPort.StrVal; name != "" && !anyHasPort(chosen, name) {
					report(d.where, "targetPort %q is not a container port of the selected pods", name)
				}
			}
		case *monitoringv1.ServiceMonitor:
			services := servicesMatching(docs, &o.Spec.Selector)
			if len(services) == 0 {
				report(d.where, "the selector matches no Service")
			}
			for _, e := range o.Spec.Endpoints {
				for _, s := range services {
					if !hasServicePort(s, e.Port) {
						report(d.where, "Service %s has no port named %q", s.Name, e.Port)
					}
				}
			}
		case *monitoringv1.PodMonitor:
			chosen := selected(pods, &o.Spec.Selector)
			if len(chosen) == 0 {
				report(d.where, "the selector matches no pod template")
			}
			for _, e := range o.Spec.PodMetricsEndpoints {
				if e.Port == nil || !anyHasPort(chosen, *e.Port) {
					report(d.where, "podMetricsEndpoints names no container port of the selected pods")
				}
			}
		}
	}
	return errors.Join(errs...)
}

var reference = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkPodSpec: names, probes on declared ports, environment variables defined before their
// $(NAME) references (Kubernetes leaves a reference to a later or missing variable as it is).
func checkPodSpec(spec corev1.PodSpec) []string {
	var out []string
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	if len(spec.Containers) == 0 {
		out = append(out, "no containers")
	}
	for _, c := range all {
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			out = append(out, fmt.Sprintf("container name %q: %s", c.Name, msg))
		}
		ports := map[string]bool{}
		for _, p := range c.Ports {
			if p.Name != "" {
				for _, msg := range validation.IsValidPortName(p.Name) {
					out = append(out, fmt.Sprintf("container %s port %q: %s", c.Name, p.Name, msg))
				}
				ports[p.Name] = true
			}
		}
		for kind, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if probe != nil && probe.HTTPGet != nil {
				if name := probe.HTTPGet.Port.StrVal; name != "" && !ports[name] {
					out = append(out, fmt.Sprintf("container %s: the %s probe uses port %q, which it does not declare", c.Name, kind, name))
				}
			}
		}
		defined := map[string]bool{}
		for _, e := range c.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				out = append(out, fmt.Sprintf("container %s env %q: %s", c.Name, e.Name, msg))
			}
			for _, m := range reference.FindAllStringSubmatch(e.Value, -1) {
				if !defined[m[1]] {
					out = append(out, fmt.Sprintf("container %s env %s refers to $(%s), not defined before it", c.Name, e.Name, m[1]))
				}
			}
			defined[e.Name] = true
		}
		mounted := map[string]bool{}
		for _, v := range spec.Volumes {
			mounted[v.Name] = true
		}
		for _, m := range c.VolumeMounts {
			if !mounted[m.Name] {
				out = append(out, fmt.Sprintf("container %s mounts volume %q, which the pod does not have", c.Name, m.Name))
			}
		}
	}
	return out
}

func matches(selector *metav1.LabelSelector, set map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil || s.Empty() {
		return false
	}
	return s.Matches(labels.Set(set))
}

func selected(pods []pod, selector *metav1.LabelSelector) []pod {
	var out []pod
	for _, p := range pods {
		if matches(selector, p.labels) {
			out = append(out, p)
		}
	}
	return out
}

func anyHasPort(pods []pod, name string) bool {
	for _, p := range pods {
		for _, c := range append(append([]corev1.Container{}, p.spec.InitContainers...), p.spec.Containers...) {
			for _, port := range c.Ports {
				if port.Name == name {
					return true
				}
			}
		}
	}
	return false
}

func servicesMatching(docs []document, selector *metav1.LabelSelector) []*corev1.Service {
	var out []*corev1.Service
	for _, d := range docs {
		if s, ok := d.object.(*corev1.Service); ok && matches(selector, s.Labels) {
			out = append(out, s)
		}
	}
	return out
}

func hasServicePort(s *corev1.Service, name string) bool {
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}
