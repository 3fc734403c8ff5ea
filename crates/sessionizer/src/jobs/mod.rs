//! The kinds of task the runtime runs: the command line's JSON session window
//! ([`json`]), and the library's session windows and stateful functions.

pub(crate) mod json;
