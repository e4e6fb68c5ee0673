//! kvgate
