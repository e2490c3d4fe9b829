package async

// ListenerPID is the server process of the listening connection of t's
// partition 0, or 0 when it has none (for tests that kill it). A
// function, not a method: the Transport's methods mirror sync.Transport's
// (TestMirrorsSync).
func ListenerPID(t *Transport) uint32 {
	if l := t.parts[0].listener; l != nil {
		return l.BackendPID()
	}
	return 0
}
