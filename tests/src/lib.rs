//! Support code for the end-to-end tests.
