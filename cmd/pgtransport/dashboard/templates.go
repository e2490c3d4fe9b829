package dashboard

import (
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"strings"
	"time"

	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/show"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var embedded embed.FS

// staticFS serves /static/: the script and the style sheet.
var staticFS fs.FS = embedded

// pageTemplate is one page: the layout with the page's content.
type pageTemplate = *template.Template

var pageNames = []string{"overview", "groups", "group", "tenants", "dead", "letter", "confirm", "error"}

func parsePages() (map[string]pageTemplate, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	pages := make(map[string]pageTemplate, len(pageNames))
	for _, name := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		pages[name] = t
	}
	return pages, nil
}

var funcs = template.FuncMap{
	"age":   show.Age,
	"since": func(now, t time.Time) string { return ifZero(t, show.Age(now.Sub(t))) },
	"until": func(now, t time.Time) string {
		if t.IsZero() || !t.After(now) {
			return "-"
		}
		return show.Age(t.Sub(now))
	},
	"agesec": func(secs float64, exact bool) string {
		a := show.Age(time.Duration(secs * float64(time.Second)))
		if !exact && a != "-" {
			return "~" + a
		}
		return a
	},
	"num":   num,
	"count": func(n int64, exact bool) string { return map[bool]string{true: "", false: "~"}[exact] + num(n) },
	"seq": func(s int64) string {
		if s == 0 {
			return "-"
		}
		return fmt.Sprint(s)
	},
	"clip":  show.Clip,
	"pct":   func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
	"rate":  func(f float64) string { return fmt.Sprintf("%.1f", f) },
	"stamp": func(t time.Time) string { return ifZero(t, t.UTC().Format("2006-01-02 15:04:05 UTC")) },
	"dash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
}

func ifZero(t time.Time, s string) string {
	if t.IsZero() {
		return "-"
	}
	return s
}

// num formats n with thousands separators, as dashboard.js's num does.
func num(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
