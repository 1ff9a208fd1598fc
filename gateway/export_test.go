package gateway

// BodyBytesHeld is the request-body bytes h holds against its budget.
func BodyBytesHeld(h *Handler) int64 { return h.held.Load() }

// GatewayBodyBytesHeld is BodyBytesHeld of g's Handler.
func GatewayBodyBytesHeld(g *Gateway) int64 { return g.proxy.held.Load() }
