package async

// ListenerPID is the server process of the Transport's listening
// connection, or 0 when it has none (for tests that kill it).
func (t *Transport) ListenerPID() uint32 {
	if t.listener == nil {
		return 0
	}
	return t.listener.BackendPID()
}
