// Package admission holds the vocabulary that the bulkhead facade and its
// engine share: requests and usage, reservations, limits, rejection reasons
// and details, events and statistics.
//
// Users never need to import it: the root package bulkhead re-exports every
// type here under the same name. It exists so that the engine (package actor)
// and the estimators (package estimate) can speak the same types as the
// facade without importing it.
package admission
