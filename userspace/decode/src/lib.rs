//! (module docs to come)
