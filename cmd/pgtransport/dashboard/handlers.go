package dashboard

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/purge"
	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/show"
)

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", s.overview)
	m.HandleFunc("GET /api/overview", s.overviewJSON)
	m.HandleFunc("GET /groups", s.groups)
	m.HandleFunc("GET /group", s.group)
	m.HandleFunc("GET /tenants", s.tenants)
	m.HandleFunc("GET /dead", s.dead)
	m.HandleFunc("GET /dead/letter", s.letter)
	m.HandleFunc("GET /confirm", s.confirm)
	m.HandleFunc("POST /action", s.action)
	m.Handle("GET /static/", http.FileServerFS(staticFS))
	s.mux = m
}

// view is what every page template gets.
type view struct {
	Title   string
	Nav     string // the menu entry to mark
	Actions bool   // actions are allowed
	Flash   string // the outcome of the action just done
	Data    any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, name string, v view) {
	v.Actions = s.cfg.AllowActions
	v.Flash = flash(r.URL.Query())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if err := s.pages[name].Execute(w, v); err != nil {
		s.cfg.Logger.Error("dashboard: render", "page", name, "err", err)
	}
}

// fail shows err as a page: 404 for an unknown group or dead letter, 400
// for a bad argument, else 500 (the error is the database's or the
// library's, shown to the operator whose page it is).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, pgtransport.ErrUnknownGroup), errors.Is(err, errNotFound):
		code = http.StatusNotFound
	case errors.Is(err, pgtransport.ErrInvalidGroup), errors.Is(err, pgtransport.ErrInvalidQuery),
		errors.Is(err, pgtransport.ErrInvalidBatch), errors.Is(err, pgtransport.ErrInvalidTenant), errors.Is(err, errBadRequest):
		code = http.StatusBadRequest
	}
	s.render(w, r, code, "error", view{Title: http.StatusText(code), Data: err.Error()})
}

var (
	errNotFound   = errors.New("not found")
	errBadRequest = errors.New("bad request")
)

// --- Overview ---

// overviewData is the JSON the overview polls, and the overview page's
// first rendering.
type overviewData struct {
	Error      string               `json:"error"` // the last sample failed: why
	At         time.Time            `json:"at"`    // the server's clock at the sample
	Total      show.PriorityStats   `json:"total"`
	ByPriority []show.PriorityStats `json:"by_priority"`
	Waiting    int64                `json:"waiting"`
	Points     []point              `json:"points"`
	Window     float64              `json:"window_seconds"`
	Interval   float64              `json:"interval_seconds"`
}

func (s *Server) overviewData(ctx context.Context, read bool) (overviewData, error) {
	samples, lastErr := s.latest()
	d := overviewData{Window: s.cfg.Window.Seconds(), Interval: s.cfg.Interval.Seconds(), Points: points(samples), ByPriority: []show.PriorityStats{}}
	if lastErr != nil {
		d.Error = lastErr.Error()
	}
	st, err := s.stats(ctx, read)
	if err != nil {
		return d, err
	}
	d.At, d.Waiting, d.Total = st.At.UTC(), st.Waiting, show.Priority(st.Total)
	for _, p := range st.ByPriority {
		d.ByPriority = append(d.ByPriority, show.Priority(p))
	}
	return d, nil
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	d, err := s.overviewData(r.Context(), true)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "overview", view{Title: "Overview", Nav: "overview", Data: d})
}

func (s *Server) overviewJSON(w http.ResponseWriter, r *http.Request) {
	d, err := s.overviewData(r.Context(), false)
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		d.Error = err.Error()
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(d)
}

// --- Groups ---

// groupList is one of the stuck-first lists the groups page offers.
type groupList struct {
	Key, Label, Help string
	Query            pgtransport.GroupQuery
}

var groupLists = []groupList{
	{"oldest", "Oldest heads", "groups whose next message has waited longest", pgtransport.GroupQuery{Order: pgtransport.OldestHead}},
	{"held", "Held longest", "leased groups, the holder that has run longest first", pgtransport.GroupQuery{Order: pgtransport.HeldLongest}},
	{"attempts", "Most attempts", "heads handed out more than once, most first", pgtransport.GroupQuery{Order: pgtransport.MostAttempts}},
	{"parked", "Parked", "heads that failed and wait out their backoff, oldest head first", pgtransport.GroupQuery{State: pgtransport.GroupParked, Order: pgtransport.OldestHead}},
	{"stopped", "Stopped", "heads that used their attempts (StopGroup), oldest head first", pgtransport.GroupQuery{State: pgtransport.GroupStopped, Order: pgtransport.OldestHead}},
	{"paused", "Paused", "paused groups, by id", pgtransport.GroupQuery{State: pgtransport.GroupPaused}},
	{"all", "All", "every group, by id", pgtransport.GroupQuery{}},
}

type groupsData struct {
	Lists      []groupList
	List       groupList
	Groups     []pgtransport.GroupInfo
	Now        time.Time
	Tenant     string // "": every tenant's groups
	Offset     int
	NextOffset int // 0: no next page
	PrevOffset int // -1: no previous page
}

func (s *Server) groups(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	list := groupLists[0]
	if k := q.Get("list"); k != "" {
		i := slices.IndexFunc(groupLists, func(l groupList) bool { return l.Key == k })
		if i < 0 {
			s.fail(w, r, fmt.Errorf("%w: unknown list %q", errBadRequest, k))
			return
		}
		list = groupLists[i]
	}
	offset, err := intParam(q, "offset")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	gq := list.Query
	gq.Offset, gq.Limit, gq.Tenant = offset, PageSize, q.Get("tenant")
	gs, err := s.cfg.Transport.Groups(r.Context(), gq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now, err := s.serverNow(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := groupsData{Lists: groupLists, List: list, Groups: gs, Now: now, Tenant: gq.Tenant, Offset: offset, PrevOffset: -1}
	if len(gs) == PageSize {
		d.NextOffset = offset + PageSize
	}
	if offset > 0 {
		d.PrevOffset = max(0, offset-PageSize)
	}
	s.render(w, r, http.StatusOK, "groups", view{Title: "Groups", Nav: "groups", Data: d})
}

// TenantsRefresh is how often the tenants page reloads itself. A reading
// of the tenants (every group row) serves every viewer for half of it,
// and the rates are between the last two readings.
const TenantsRefresh = 10 * time.Second

// tenantsReadEvery is how old a reading may be before a view reads again.
var tenantsReadEvery = TenantsRefresh / 2

type tenantRow struct {
	pgtransport.TenantInfo
	Rate *pgtransport.TenantRate // nil: no reading before this one to compare with
}

type tenantsData struct {
	Tenants []tenantRow
	Since   time.Duration // the rates' window (0: none)
	Refresh int           // seconds
	Every   time.Duration // tenantsReadEvery
}

// tenantsReading is one reading of Transport.Tenants, and when.
type tenantsReading struct {
	at      time.Time
	tenants []pgtransport.TenantInfo
}

// tenants lists the tenants, with each one's deliveries per second and
// measured share between the last two readings (at most 5 minutes
// apart). Only this page reads them, never the sampler, and at most once
// every tenantsReadEvery however many viewers it has.
func (s *Server) tenants(w http.ResponseWriter, r *http.Request) {
	s.tenantsMu.Lock() // one reading at a time; the sampler does not take it
	prev, last := s.tenantsReads[0], s.tenantsReads[1]
	if last.at.IsZero() || time.Since(last.at) >= tenantsReadEvery {
		ts, err := s.cfg.Transport.Tenants(r.Context())
		if err != nil {
			s.tenantsMu.Unlock()
			s.fail(w, r, err)
			return
		}
		prev, last = last, tenantsReading{at: time.Now(), tenants: ts}
		s.tenantsReads = [2]tenantsReading{prev, last}
	}
	s.tenantsMu.Unlock()
	d := tenantsData{Tenants: make([]tenantRow, len(last.tenants)), Refresh: int(TenantsRefresh.Seconds()), Every: tenantsReadEvery}
	var rates []pgtransport.TenantRate
	if gap := last.at.Sub(prev.at); !prev.at.IsZero() && gap <= 5*time.Minute {
		d.Since = gap.Round(100 * time.Millisecond)
		rates = pgtransport.Rates(prev.tenants, last.tenants, gap)
	}
	for i, t := range last.tenants {
		d.Tenants[i].TenantInfo = t
		if rates != nil {
			d.Tenants[i].Rate = &rates[i]
		}
	}
	s.render(w, r, http.StatusOK, "tenants", view{Title: "Tenants", Nav: "tenants", Data: d})
}

type groupData struct {
	Group    pgtransport.GroupInfo
	Messages []pgtransport.PeekedMessage
	Now      time.Time
}

func (s *Server) group(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("g")
	if id == "" {
		http.Redirect(w, r, "/groups", http.StatusSeeOther)
		return
	}
	g, err := s.cfg.Transport.Group(r.Context(), id)
	if err != nil {
		s.fail(w, r, fmt.Errorf("group %q: %w", id, err))
		return
	}
	var ms []pgtransport.PeekedMessage
	if g.HeadSeq != 0 {
		if ms, err = s.cfg.Transport.Peek(r.Context(), id, PeekSize); err != nil && !errors.Is(err, pgtransport.ErrUnknownGroup) {
			s.fail(w, r, err)
			return
		}
	}
	now, err := s.serverNow(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "group", view{Title: "Group " + id, Nav: "groups", Data: groupData{g, ms, now}})
}

// --- Dead letters ---

type deadData struct {
	Group   string
	Letters []pgtransport.DeadLetter
	Now     time.Time
	After   int64
	Next    int64 // 0: no next page
}

func (s *Server) dead(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, err := intParam(q, "after")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	group := q.Get("group")
	ds, err := s.cfg.Transport.DeadLetters(r.Context(), pgtransport.DeadLetterQuery{Group: group, After: int64(after), Limit: PageSize})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now, err := s.serverNow(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := deadData{Group: group, Letters: ds, Now: now, After: int64(after)}
	if len(ds) == PageSize {
		d.Next = ds[len(ds)-1].Seq
	}
	s.render(w, r, http.StatusOK, "dead", view{Title: "Dead letters", Nav: "dead", Data: d})
}

// deadLetter reads the dead letter with seq.
func (s *Server) deadLetter(ctx context.Context, seq int64) (pgtransport.DeadLetter, error) {
	ds, err := s.cfg.Transport.DeadLetters(ctx, pgtransport.DeadLetterQuery{After: seq - 1, Limit: 1})
	if err != nil {
		return pgtransport.DeadLetter{}, err
	}
	if len(ds) == 0 || ds[0].Seq != seq {
		return pgtransport.DeadLetter{}, fmt.Errorf("dead letter %d: %w (redriven, purged, or never dead)", seq, errNotFound)
	}
	return ds[0], nil
}

type letterData struct {
	Letter pgtransport.DeadLetter
	Now    time.Time
}

func (s *Server) letter(w http.ResponseWriter, r *http.Request) {
	seq, err := intParam(r.URL.Query(), "seq")
	if err != nil || seq == 0 {
		s.fail(w, r, fmt.Errorf("%w: seq: want a positive number", errBadRequest))
		return
	}
	d, err := s.deadLetter(r.Context(), int64(seq))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now, err := s.serverNow(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "letter", view{Title: fmt.Sprintf("Dead letter %d", seq), Nav: "dead", Data: letterData{d, now}})
}

// --- Actions ---

// act is one action the dashboard can take.
type act struct {
	Verb     string // the button
	Question string // what the confirmation asks, with %s for the target
	OnGroup  bool   // the target is a group (else a dead letter's seq)
}

var acts = map[string]act{
	"pause":     {"Pause", "Pause group %s? No consumer claims it until it is resumed; a holder mid-message may finish it.", true},
	"resume":    {"Resume", "Resume group %s? It goes back into the round-robin, its messages in their order.", true},
	"purge":     {"Purge", "Delete every message of group %s for good? A holder's settle then fails with ErrLeaseLost.", true},
	"redrive":   {"Redrive", "Put dead letter %s back at the head of its group, with fresh attempts?", false},
	"deadpurge": {"Delete", "Delete dead letter %s for good?", false},
}

type confirmData struct {
	Do, Verb, Question, Group, Token, Back string
	Seq                                    int64
}

// target reads and checks an action's arguments from v (a query or a
// form).
func target(v url.Values) (string, act, string, int64, error) {
	do := v.Get("do")
	a, ok := acts[do]
	if !ok {
		return "", act{}, "", 0, fmt.Errorf("%w: unknown action %q", errBadRequest, do)
	}
	if a.OnGroup {
		g := v.Get("group")
		if g == "" {
			return "", act{}, "", 0, fmt.Errorf("%w: no group", errBadRequest)
		}
		return do, a, g, 0, nil
	}
	seq, err := strconv.ParseInt(v.Get("seq"), 10, 64)
	if err != nil || seq <= 0 {
		return "", act{}, "", 0, fmt.Errorf("%w: seq: want a positive number", errBadRequest)
	}
	return do, a, "", seq, nil
}

// back is the page an action returns to.
func back(a act, group string, seq int64) string {
	if a.OnGroup {
		return "/group?g=" + url.QueryEscape(group)
	}
	return "/dead/letter?seq=" + strconv.FormatInt(seq, 10)
}

func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	do, a, group, seq, err := target(r.URL.Query())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.cfg.AllowActions {
		s.render(w, r, http.StatusForbidden, "error", view{Title: "Actions are off", Data: errActionsOff.Error()})
		return
	}
	what := fmt.Sprintf("%q", group)
	if !a.OnGroup {
		what = strconv.FormatInt(seq, 10)
	}
	s.render(w, r, http.StatusOK, "confirm", view{Title: "Confirm", Data: confirmData{
		Do: do, Verb: a.Verb, Question: fmt.Sprintf(a.Question, what), Group: group, Seq: seq,
		Token: s.token, Back: back(a, group, seq),
	}})
}

var errActionsOff = errors.New("actions are off: this dashboard is read-only (start it with pgtransport serve --allow-actions)")

// action does a confirmed action: a POST from this dashboard's own
// confirmation page only.
func (s *Server) action(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.AllowActions {
		http.Error(w, errActionsOff.Error(), http.StatusForbidden)
		return
	}
	if err := s.cop.Check(r); err != nil {
		http.Error(w, "refused: a cross-site request ("+err.Error()+")", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
		return
	}
	token := r.PostForm.Get("token")
	if token == "" {
		token = r.Header.Get("X-CSRF-Token")
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.token)) != 1 {
		http.Error(w, "refused: missing or wrong token (reload the dashboard: a restarted server has a new one)", http.StatusForbidden)
		return
	}
	do, a, group, seq, err := target(r.PostForm)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, tr := r.Context(), s.cfg.Transport
	var (
		n    int64
		done string
	)
	switch do {
	case "pause":
		err, done = tr.PauseGroup(ctx, group), "paused"
	case "resume":
		err, done = tr.ResumeGroup(ctx, group), "resumed"
	case "purge":
		n, err = s.purge(ctx, group)
		done = "purged"
	case "redrive":
		n, err = tr.Redrive(ctx, pgtransport.DeadLetterFilter{Seqs: []int64{seq}})
		done = "redriven"
	case "deadpurge":
		n, err = tr.PurgeDeadLetters(ctx, pgtransport.DeadLetterFilter{Seqs: []int64{seq}})
		done = "deleted"
	}
	s.cfg.Logger.Info("dashboard: action", "do", do, "group", group, "seq", seq, "n", n, "err", err)
	if err != nil {
		s.fail(w, r, fmt.Errorf("%s: %w", do, err))
		return
	}
	to := "/dead?"
	if a.OnGroup {
		to = back(a, group, seq) + "&"
	}
	http.Redirect(w, r, fmt.Sprintf("%sdone=%s&n=%d", to, done, n), http.StatusSeeOther)
}

// purge deletes the group's messages in batches (each one transaction),
// with the group paused meanwhile (purge.Paused), until it is empty or the
// request's time is up.
func (s *Server) purge(ctx context.Context, group string) (total int64, err error) {
	err = purge.Paused(ctx, s.cfg.Transport, group, func() error {
		for {
			n, drained, err := purge.Batch(ctx, s.cfg.Transport, group, pgtransport.MaxBatch)
			total += n
			switch {
			case err != nil:
				return fmt.Errorf("after %d messages purged: %w", total, err)
			case drained:
				return nil
			}
		}
	})
	return total, err
}

// flash is the outcome of the action that redirected here.
func flash(q url.Values) string {
	c, err := strconv.ParseInt(q.Get("n"), 10, 64)
	if err != nil {
		return ""
	}
	n := num(c)
	switch q.Get("done") {
	case "paused":
		return "Group paused."
	case "resumed":
		return "Group resumed."
	case "purged":
		return "Purged " + n + " messages."
	case "redriven":
		return "Redriven: " + n + " dead letter(s) back in their group."
	case "deleted":
		return "Deleted " + n + " dead letter(s)."
	}
	return ""
}

// intParam is a non-negative integer query parameter (0 if absent).
func intParam(q url.Values, name string) (int, error) {
	v := q.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s %q: want 0 or more", errBadRequest, name, v)
	}
	return n, nil
}
