//! rivet-agent: lookup, long-poll heartbeat, command executor and inventory (filled by the
//! agent issue).
