//! (frame deformatter: in progress)
