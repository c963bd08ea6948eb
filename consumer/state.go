package consumer

// State is a consumer's lifecycle state.
type State int32

const (
	// CreateJust: made by NewLitePull, not started.
	CreateJust State = iota
	// Running: started; Poll and the other calls work.
	Running
	// StartFailed: Start failed; the consumer cannot be used.
	StartFailed
	// ShutdownAlready: Close was called.
	ShutdownAlready
)

func (s State) String() string {
	switch s {
	case CreateJust:
		return "CREATE_JUST"
	case Running:
		return "RUNNING"
	case StartFailed:
		return "START_FAILED"
	case ShutdownAlready:
		return "SHUTDOWN_ALREADY"
	}
	return "UNKNOWN"
}
