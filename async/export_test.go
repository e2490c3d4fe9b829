package async

// ListenerPID is the server process of t's listening connection, or 0
// when it has none (for tests that kill it). A function, not a method:
// the Transport's methods mirror sync.Transport's (TestMirrorsSync).
func ListenerPID(t *Transport) uint32 {
	if t.listener == nil {
		return 0
	}
	return t.listener.BackendPID()
}
