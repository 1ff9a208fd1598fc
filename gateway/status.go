package gateway

import (
	"encoding/hex"
	"encoding/json"
	"net/http"
	"time"
)

// status is what /status answers: the configuration the gateway serves,
// and its last reload.
type status struct {
	Ready      bool          `json:"ready"`
	Config     configStatus  `json:"config"`
	LastReload *reloadStatus `json:"last_reload,omitempty"`
}

type configStatus struct {
	File     string    `json:"file"`
	Revision int64     `json:"revision"`
	Digest   string    `json:"digest"`
	Loaded   time.Time `json:"loaded_at"`
}

type reloadStatus struct {
	Result   ReloadOutcome `json:"result"`
	At       time.Time     `json:"at"`
	Changes  []string      `json:"changes,omitempty"`
	Error    string        `json:"error,omitempty"`
	Revision int64         `json:"revision"`
}

// serveStatus answers /status: whether the gateway is ready, the revision
// and digest (the SHA-256 of the file's bytes) of the configuration it
// serves, and what its last reload did, as JSON.
func (g *Gateway) serveStatus(w http.ResponseWriter, _ *http.Request) {
	st := g.state.Load()
	s := status{Ready: !g.notReady.Load(), Config: configStatus{File: st.file, Revision: st.revision,
		Digest: "sha256:" + hex.EncodeToString(st.digest[:]), Loaded: st.loaded.UTC()}}
	if r := g.reload.last.Load(); r != nil {
		rs := &reloadStatus{Result: r.Outcome, At: r.At.UTC(), Revision: r.Revision}
		for _, c := range r.Changes {
			rs.Changes = append(rs.Changes, c.String())
		}
		if r.Err != nil {
			rs.Error = r.Err.Error()
		}
		s.LastReload = rs
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(s)
}
