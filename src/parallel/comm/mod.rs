//! Collective communication between devices (being written).
