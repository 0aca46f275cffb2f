//! The macro's driver: parse → validate → generate.
//!
//! Kept free of `proc_macro` so that it also compiles outside the proc-macro crate: the
//! workspace's `tests/expand.rs` includes these sources to snapshot an expansion.

use proc_macro2::TokenStream;

use crate::generate::generate;
use crate::parse::{Errors, parse_attr, parse_item};
use crate::validate::validate;

/// Expands `#[rpc_service(<attr>)] <item>`. Errors (all of them, each spanned on the
/// offending tokens) come back as `compile_error!` invocations in place of the expansion.
#[doc(hidden)]
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = parse_attr(attr, &mut errors);
    let item = match parse_item(item) {
        Ok(item) => item,
        Err(err) => {
            errors.push(err);
            return errors
                .finish()
                .expect_err("an error was pushed")
                .into_compile_error();
        }
    };
    match validate(args, item, errors) {
        Ok(service) => generate(&service),
        Err(err) => err.into_compile_error(),
    }
}
