// Package admission is the engine's own vocabulary: the small types that the
// admission actor (package actor) and the class policy (package classes)
// speak to each other and to the facade: reasons, reservations, limits,
// details, events and statistics.
//
// Everyday users never need it: they see the root package's types, which
// are defined there with their documentation; the facade converts at the
// boundary, on cold paths only (rejections, statistics, events, limits). It
// imports nothing of the engine, so packages that only need its sentinel
// errors (pacer, fleet) stay free of the actor engine.
package admission
