// Package p2p is tent's default metadata: no service at all. A segment is
// named by its engine's "host:port" (the engine's listen address), and the
// descriptor is asked of the engine itself over its control link, which
// also pushes every change; there is nothing to publish.
//
// The directory only says where a name leads. Resolve checks the name
// whole as a dialable address (netaddr.CheckDial) before anything dials
// it, and answers with a descriptor that holds nothing but the control
// endpoint at that address; core then fetches the real descriptor from
// there. Engines of one process reach each other by name or by listen
// address within the scope "p2p", without the network (Scope), and a name
// or address one live engine answers to is refused to a second.
package p2p
