// The overview's live part: poll /api/overview and redraw the numbers and
// the two charts. No library, no build step; the page works without it
// (the numbers as rendered, no chart).
(function () {
  'use strict';
  var root = document.getElementById('overview');
  if (!root) return;
  var every = Math.min(Math.max(Number(root.dataset.interval) || 2, 1), 10) * 1000;

  // Plot area of each 600x170 chart.
  var X0 = 44, X1 = 590, Y0 = 150, Y1 = 10;

  function num(n) { return Math.round(n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  function count(n, exact) { return (exact ? '' : '~') + num(n); }
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  // age is templates.go's age.
  function age(secs) {
    var s = Math.round(secs);
    if (!(s > 0)) return '-';
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + pad(s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h' + pad(Math.floor(s % 3600 / 60)) + 'm';
    return Math.floor(s / 86400) + 'd' + pad(Math.floor(s % 86400 / 3600)) + 'h';
  }
  function set(id, text) {
    var e = document.getElementById(id);
    if (e && e.textContent !== text) e.textContent = text;
  }
  function tick(v) { return v < 10 ? String(+v.toFixed(1)) : num(v); }
  function rate(v) { return v == null ? '-' : (v < 10 ? v.toFixed(1) : num(v)); }
  // top is a round ceiling for an axis: 1, 2 or 5 times a power of ten.
  function top(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 3, 5, 10];
    for (var i = 0; i < steps.length; i++) if (v <= steps[i] * p) return steps[i] * p;
    return 10 * p;
  }
  // path draws key over the window ending at the last point; null breaks
  // the line.
  function path(points, key, end, win, ymax) {
    var d = [], pen = false;
    for (var i = 0; i < points.length; i++) {
      var p = points[i], v = p[key];
      if (v == null || p.t < end - win) { pen = false; continue; }
      var x = X0 + (p.t - (end - win)) / win * (X1 - X0);
      var y = Y0 - v / ymax * (Y0 - Y1);
      d.push((pen ? 'L' : 'M') + x.toFixed(1) + ' ' + y.toFixed(1));
      pen = true;
    }
    return d.join(' ');
  }
  function setPath(id, d) {
    var e = document.getElementById(id);
    if (e && e.getAttribute('d') !== d) e.setAttribute('d', d);
  }

  function update(d) {
    var t = d.total;
    set('depth', count(t.messages, t.messages_exact));
    set('depth-now', count(t.messages, t.messages_exact));
    set('oldest', (t.oldest_head_exact || !(t.oldest_head_age_seconds > 0) ? '' : '~') + age(t.oldest_head_age_seconds));
    set('groups', count(t.groups, t.groups_exact));
    set('waiting', num(d.waiting));
    set('dead', count(t.dead_letters, t.dead_letters_exact));
    set('free', count(t.free, t.groups_exact));
    ['leased', 'parked', 'stopped', 'paused'].forEach(function (k) { set(k, num(t[k])); });
    var rows = document.getElementById('priorities');
    if (rows) {
      d.by_priority.forEach(function (p, i) {
        var r = rows.rows[i];
        if (!r) return;
        var cells = [String(p.priority), count(p.groups, p.groups_exact), count(p.free, p.groups_exact), num(p.leased), num(p.parked), num(p.stopped), num(p.paused),
          count(p.messages, p.messages_exact), (p.oldest_head_exact || !(p.oldest_head_age_seconds > 0) ? '' : '~') + age(p.oldest_head_age_seconds),
          count(p.dead_letters, p.dead_letters_exact)];
        cells.forEach(function (c, j) { if (r.cells[j] && r.cells[j].textContent !== c) r.cells[j].textContent = c; });
      });
    }
    var pts = d.points || [], win = d.window_seconds || 300;
    var end = pts.length ? pts[pts.length - 1].t : Date.now() / 1000;
    var rmax = 0, dmax = 0;
    pts.forEach(function (p) {
      if (p.t < end - win) return;
      rmax = Math.max(rmax, p.published || 0, p.acked || 0);
      dmax = Math.max(dmax, p.depth || 0);
    });
    rmax = top(rmax); dmax = top(dmax);
    set('rate-max', num(rmax)); set('depth-max', num(dmax));
    set('rate-mid', tick(rmax / 2)); set('depth-mid', tick(dmax / 2));
    setPath('line-published', path(pts, 'published', end, win, rmax));
    setPath('line-acked', path(pts, 'acked', end, win, rmax));
    setPath('line-depth', path(pts, 'depth', end, win, dmax));
    var last = pts.length ? pts[pts.length - 1] : {};
    set('rate-published', rate(last.published));
    set('rate-acked', rate(last.acked));
    set('status', d.error ? 'sampling failed: ' + d.error : 'read at ' + d.at.replace('T', ' ').replace(/\.\d+/, '').replace('Z', ' UTC') + ' (server clock)');
    root.classList.toggle('stale', !!d.error);
  }

  function poll() {
    fetch('/api/overview', { cache: 'no-store', credentials: 'same-origin' })
      .then(function (r) {
        return r.json().then(function (d) {
          if (!r.ok) throw new Error(d.error || r.statusText);
          return d;
        });
      })
      .then(update)
      .catch(function (e) { set('status', 'not updated: ' + e.message); root.classList.add('stale'); })
      .then(function () { setTimeout(poll, every); });
  }
  poll();
})();
