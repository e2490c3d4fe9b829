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

var pageNames = []string{"overview", "groups", "group", "dead", "letter", "confirm", "error"}

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
	"age":   age,
	"since": func(now, t time.Time) string { return ifZero(t, age(now.Sub(t))) },
	"until": func(now, t time.Time) string {
		if t.IsZero() || !t.After(now) {
			return "-"
		}
		return age(t.Sub(now))
	},
	"agesec": func(secs float64, exact bool) string {
		a := age(time.Duration(secs * float64(time.Second)))
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

// age formats a duration as the command's tables do: whole seconds under
// a minute, then two units ("3m04s", "2h05m", "3d04h"); "-" for zero or
// less. dashboard.js's age is the same.
func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
	}
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
