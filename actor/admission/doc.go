// Package admission is the engine's own vocabulary: the small types that the
// admission actor (package actor) and the class policy (package classes)
// speak to each other and to the facade: reasons, reservations, limits,
// details, events and statistics.
//
// Everyday users never need it: they see the root package's types, which
// are defined there with their documentation. This vocabulary is the
// engine's own compact form, not a copy of those: one event record for
// every kind, counts in arrays indexed by reason, what a class holds
// without what follows from it. The facade converts at the boundary, on
// cold paths only (rejections, statistics, events, limits), and derives the
// rest; a round-trip test of the root package guards what the two must
// keep parallel. It imports nothing of the engine, so packages that only
// need its sentinel errors (pacer, fleet) stay free of the actor engine.
package admission
