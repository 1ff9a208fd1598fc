// Package docs_test checks the guides in this directory and the README:
// every Go snippet compiles, every guide is linked from the README, every
// relative link leads somewhere, and the metrics and gateway guides name
// every metric family and every configuration key.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/format"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/family"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// root is the module's root, relative to this package.
const root = ".."

// maxReadmeLines bounds the README: what does not fit goes to a guide.
const maxReadmeLines = 300

// pages returns the README and every guide, by path relative to root.
func pages(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(guides) == 0 {
		t.Fatal("no guides in docs/")
	}
	out := []string{"README.md"}
	for _, g := range guides {
		rel, err := filepath.Rel(root, g)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

func read(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// snippet is one ```go block of a page.
type snippet struct {
	page string
	line int // the line of its first line of code
	code string
}

// fence matches the line that opens or closes a fenced block.
var fence = regexp.MustCompile("^\\s*```")

// snippets returns the ```go blocks of page.
func snippets(t *testing.T, page string) []snippet { return blocks(t, page, "go") }

// blocks returns the fenced blocks of page in language lang.
func blocks(t *testing.T, page, lang string) []snippet {
	t.Helper()
	var out []snippet
	var cur *snippet
	var open bool
	sc := bufio.NewScanner(strings.NewReader(read(t, page)))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case !open && fence.MatchString(line):
			open = true
			if strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(line), "`")) == lang {
				cur = &snippet{page: page, line: n + 1}
			}
		case open && fence.MatchString(line):
			open = false
			if cur != nil {
				out = append(out, *cur)
				cur = nil
			}
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	if open {
		t.Errorf("%s: a fenced block is never closed", page)
	}
	return out
}

// TestSnippetsCompile type-checks every ```go block of the README and the
// guides. Each block is a whole Go file, package clause and imports
// included, so that a reader can copy it as it is; it is checked against
// the module's packages as they are now, and must be gofmt'ed.
func TestSnippetsCompile(t *testing.T) {
	fset := token.NewFileSet()
	type parsed struct {
		snippet
		file *ast.File
	}
	var all []parsed
	imports := map[string]bool{}
	for _, page := range pages(t) {
		for _, s := range snippets(t, page) {
			// The line directive makes positions those of the page.
			src := fmt.Sprintf("//line %s:%d\n%s", filepath.Base(s.page), s.line, s.code) // relative to the page's directory
			f, err := parser.ParseFile(fset, s.page, src, parser.ParseComments)
			if err != nil {
				t.Errorf("the snippet at %s:%d is not a Go file (each ```go block is a whole file, from its package clause): %v", s.page, s.line, err)
				continue
			}
			if formatted, err := format.Source([]byte(s.code)); err == nil && string(formatted) != s.code {
				t.Errorf("the snippet at %s:%d is not formatted as gofmt formats it", s.page, s.line)
			}
			for _, imp := range f.Imports {
				imports[strings.Trim(imp.Path.Value, `"`)] = true
			}
			all = append(all, parsed{s, f})
		}
	}
	if len(all) == 0 {
		t.Fatal("no Go snippets found")
	}
	exports := exportData(t, imports)
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q", path)
		}
		return os.Open(file)
	})
	for _, p := range all {
		var errs []string
		conf := types.Config{Importer: imp, Error: func(err error) { errs = append(errs, err.Error()) }}
		_, _ = conf.Check(p.file.Name.Name, fset, []*ast.File{p.file}, nil)
		for _, e := range errs {
			t.Errorf("%s", e)
		}
	}
	t.Logf("%d snippets type-checked", len(all))
}

// exportData returns the export data files of the packages imports names
// and of their dependencies, built by the go command.
func exportData(t *testing.T, imports map[string]bool) map[string]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH")
	}
	args := []string{"list", "-e", "-export", "-deps", "-json=ImportPath,Export,Error"}
	for path := range imports {
		args = append(args, path)
	}
	sort.Strings(args[5:])
	cmd := exec.Command(goTool, args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath, Export string
			Error              *struct{ Err string }
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Error != nil {
			t.Errorf("a snippet imports %s: %s", p.ImportPath, p.Error.Err)
			continue
		}
		exports[p.ImportPath] = p.Export
	}
	return exports
}

// TestReadme checks that the README stays short and links every guide.
func TestReadme(t *testing.T) {
	readme := read(t, "README.md")
	if n := strings.Count(readme, "\n"); n >= maxReadmeLines {
		t.Errorf("README.md has %d lines; keep it under %d and move the rest to a guide in docs/", n, maxReadmeLines)
	}
	for _, page := range pages(t)[1:] {
		if !strings.Contains(readme, "("+page+")") && !strings.Contains(readme, "("+page+"#") {
			t.Errorf("README.md does not link %s", page)
		}
	}
}

// link matches a markdown link's target.
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinks checks that every relative link of the README and the guides
// leads to a file of the repository and, with a #fragment, to one of its
// headings.
func TestLinks(t *testing.T) {
	for _, page := range pages(t) {
		text := read(t, page)
		for _, m := range link.FindAllStringSubmatch(stripCode(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := page
			if file != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
				if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
					t.Errorf("%s: link %s: %v", page, target, err)
					continue
				}
			}
			if frag != "" {
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s: link %s: a fragment of a file that is not markdown", page, target)
					continue
				}
				if !anchors(read(t, dest))[frag] {
					t.Errorf("%s: link %s: %s has no heading #%s", page, target, dest, frag)
				}
			}
		}
	}
}

// stripCode returns text without its fenced blocks, where links are not
// links.
func stripCode(text string) string {
	var b strings.Builder
	open := false
	for _, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			open = !open
			continue
		}
		if !open {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// anchors returns the fragments that the headings of a markdown text get,
// as GitHub makes them: lower case, punctuation dropped, spaces to hyphens,
// a repeated one numbered.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(stripCode(text), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// metricName matches the name given to a metric family in package metrics.
var metricName = regexp.MustCompile(`(?:d\.new|\bd|\bhist|byOutcome)\("([a-z_]+)"`)

// TestMetricsGuide checks that the metrics guide names every metric family
// package metrics defines: those read from Stats (package family) and the
// collectors' own.
func TestMetricsGuide(t *testing.T) {
	guide := read(t, "docs/metrics.md")
	n := 0
	for _, f := range family.All {
		n++
		if name := "bulkhead_" + f.Name; !strings.Contains(guide, name) {
			t.Errorf("docs/metrics.md does not name %s (internal/family)", name)
		}
	}
	for _, h := range family.Histograms {
		n++
		if name := "bulkhead_" + h.Name; !strings.Contains(guide, name) {
			t.Errorf("docs/metrics.md does not name %s (internal/family)", name)
		}
	}
	for _, file := range []string{"metrics/collector.go", "metrics/pool.go"} {
		for _, m := range metricName.FindAllStringSubmatch(read(t, file), -1) {
			n++
			if name := "bulkhead_" + m[1]; !strings.Contains(guide, name) {
				t.Errorf("docs/metrics.md does not name %s (%s)", name, file)
			}
		}
	}
	if n < 50 {
		t.Errorf("found only %d metric families in package metrics: has the way they are named changed?", n)
	}
	gatewayGuide := read(t, "docs/gateway.md")
	for _, file := range []string{"gateway/early.go", "gateway/gateway.go", "gateway/reload.go"} {
		gw := gatewayMetric.FindAllStringSubmatch(read(t, file), -1)
		if len(gw) == 0 {
			t.Errorf("found no metric family in %s: has the way it is named changed?", file)
		}
		for _, m := range gw {
			if !strings.Contains(guide, m[1]) {
				t.Errorf("docs/metrics.md does not name %s (%s)", m[1], file)
			}
			if !strings.Contains(gatewayGuide, m[1]) {
				t.Errorf("docs/gateway.md does not name %s (%s)", m[1], file)
			}
		}
	}
}

// otelName matches an attribute key, span or event name or instrument name
// of package otelbulkhead or of the gateway's spans.
var otelName = regexp.MustCompile(`(?:Key\(|= )"((?:gen_ai|bulkhead|error|http|url|server|client|user_agent)\.[a-z_.]+)"`)

// TestObservabilityGuide checks that the observability guide names every
// attribute, span event and instrument of package otelbulkhead, and every
// attribute of the gateway's spans.
func TestObservabilityGuide(t *testing.T) {
	guide := read(t, "docs/observability.md")
	for file, least := range map[string]int{"otelbulkhead/attrs.go": 30, "internal/semconv/semconv.go": 10, "gateway/trace.go": 20} {
		n := 0
		for _, m := range otelName.FindAllStringSubmatch(read(t, file), -1) {
			n++
			if !strings.Contains(guide, "`"+m[1]+"`") && !strings.Contains(guide, "`"+m[1]+".") {
				t.Errorf("docs/observability.md does not name %s (%s)", m[1], file)
			}
		}
		if n < least {
			t.Errorf("found only %d names in %s: has the way they are named changed?", n, file)
		}
	}
}

// gatewayMetric matches the name of a metric family package gateway serves.
var gatewayMetric = regexp.MustCompile(`(?:NewDesc\(|Name: )"(bulkhead_[a-z_]+)"`)

// TestGatewayGuide checks that the gateway guide names every key of the
// gateway's configuration file, and that its YAML blocks are valid
// configurations (a TLS certificate aside), as bulkhead gateway -check
// would find them.
func TestGatewayGuide(t *testing.T) {
	guide := read(t, "docs/gateway.md")
	files := blocks(t, "docs/gateway.md", "yaml")
	if len(files) == 0 {
		t.Error("docs/gateway.md has no yaml block")
	}
	tls := regexp.MustCompile(`(?m)^tls:.*$`)
	for _, f := range files {
		name := fmt.Sprintf("docs/gateway.md (the yaml block at line %d), line", f.line)
		cfg, err := gateway.ParseConfig(name, []byte(tls.ReplaceAllString(f.code, "")))
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		env := func(name string) (string, bool) { // every variable the file names; OpenTelemetry's as unset
			return "a-key-of-sixteen-characters-or-more", !strings.HasPrefix(name, "OTEL_")
		}
		g, err := gateway.Build(cfg, name, env, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		g.Shutdown(context.Background())
	}
	keys := map[string]bool{}
	yamlKeys(reflect.TypeFor[gateway.Config](), keys)
	if len(keys) < 40 {
		t.Fatalf("found only %d keys in gateway.Config", len(keys))
	}
	for k := range keys {
		if !regexp.MustCompile("(?m)(^|[\\s{`])" + regexp.QuoteMeta(k) + "[:`]").MatchString(guide) {
			t.Errorf("docs/gateway.md does not name the key %s", k)
		}
	}
}

// yamlKeys adds the YAML keys of t, and of the types it holds, to keys.
func yamlKeys(t reflect.Type, keys map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		keys[name] = true
		yamlKeys(f.Type, keys)
	}
}
