//! Inspection logic without I/O: what an inventory says about a node (properties, root disk,
//! ports, resource class) and the operator's inspection rules. The conductor feeds it an
//! inventory and writes what it returns.

pub mod derive;
pub mod rules;
