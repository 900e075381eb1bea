package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// valuesTable prints the Markdown table of a Helm values file: one row per key whose comment
// starts with "# --", with its default. A key without such a comment is an error unless it is
// a map whose keys have one, so the table cannot leave a value out.
func valuesTable(name string, out io.Writer) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("%s: not a map of values", name)
	}
	var rows []string
	if err := walk(root.Content[0], "", &rows); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	fmt.Fprintln(out, "| key | default | description |")
	fmt.Fprintln(out, "|---|---|---|")
	for _, r := range rows {
		fmt.Fprintln(out, r)
	}
	return nil
}

func walk(mapping *yaml.Node, prefix string, rows *[]string) error {
	for i := 0; i+1 < len(mapping.Content); i += 2 {
		key, value := mapping.Content[i], mapping.Content[i+1]
		path := prefix + key.Value
		doc, ok := description(key.HeadComment)
		switch {
		case ok:
			var v any
			if err := value.Decode(&v); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			def, err := json.Marshal(v)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			*rows = append(*rows, fmt.Sprintf("| `%s` | `%s` | %s |", path, def, strings.ReplaceAll(doc, "|", `\|`)))
		case value.Kind == yaml.MappingNode && len(value.Content) > 0:
			if err := walk(value, path+".", rows); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s (line %d) has no `# --` comment", path, key.Line)
		}
	}
	return nil
}

// description: the last paragraph of a key's head comment, if it starts with "# --".
func description(comment string) (string, bool) {
	paragraphs := strings.Split(comment, "\n\n")
	last := strings.Split(paragraphs[len(paragraphs)-1], "\n")
	if len(last) == 0 || !strings.HasPrefix(last[0], "# --") {
		return "", false
	}
	words := make([]string, 0, len(last))
	for i, line := range last {
		line = strings.TrimPrefix(strings.TrimSpace(line), "#")
		if i == 0 {
			line = strings.TrimPrefix(line, " --")
		}
		words = append(words, strings.TrimSpace(line))
	}
	return strings.Join(words, " "), true
}
