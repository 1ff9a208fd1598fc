// Package classes is the admission class policy: floors, ceilings, the
// shared pool and borrowing.
//
// A Table holds a fixed set of named classes, each with optional floors
// (capacity no other class may use) and ceilings (the most the class may
// use), together with each class's in-flight slots and tokens and its
// cumulative counters. It is plain data: no goroutines, no locks. The
// admission actor owns one Table and calls it inside each atomic decision,
// so the global limits, the shared pool and the class's floor and ceiling
// are all checked in one step and two classes can never borrow the same
// shared slot.
//
// The actor drives a Table like this:
//
//	New                     validate the class table and build it (construction)
//	Lookup                  resolve a call's class name to a Class, once per call
//	Check                   the class checks, after the global budget check
//	                        (precheck without the slot, postcheck with it held)
//	Admit                   commit an admission; returns its Resources
//	Reject                  count a rejection of a call of the class
//	AdjustHold              a hold grew (overrun) or shrank (early refund)
//	Abandon                 a borrowed slot was given back early
//	Release                 settle an admission
//	Detail, Stats, Classes  copies for reject details, Stats and Limits
//	Prepare, Apply          validate, then install, a runtime replacement
//
// Every method is safe on a nil *Table and on the zero Class, None, and then
// does nothing (Check admits, Admit borrows nothing), so a bulkhead without
// classes runs the same code path.
package classes
