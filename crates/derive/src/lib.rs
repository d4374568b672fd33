//! `#[derive(Object)]`: declares the stable name a type's values are stored under.
//!
//! ```ignore
//! #[derive(Clone, Serialize, Deserialize, atomos::Object)]
//! #[atomos(name = "inventory.Item")]
//! struct Item { sku: String, count: u32 }
//! ```
//!
//! expands to `impl atomos::Object for Item { const NAME: atomos::StoredName =
//! atomos::StoredName::declared::<Self>("inventory.Item", &[]); }`. A generic type's name
//! carries its parameters' names (`inventory.Box<inventory.Item>`), and each parameter must be
//! an `Object` too. `#[atomos(crate = "path")]` names the crate that defines `Object` when it
//! is not reachable as `atomos` (inside atomos's own crates: `atomos_core`).

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::quote;
use syn::{parse_macro_input, parse_quote, DeriveInput, GenericParam, LitStr, Path};

/// Implements `Object` with the name given by `#[atomos(name = "...")]` (required).
#[proc_macro_derive(Object, attributes(atomos))]
pub fn derive_object(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What `#[atomos(...)]` says.
struct Attributes {
    name: LitStr,
    krate: Path,
}

fn attributes(input: &DeriveInput) -> syn::Result<Attributes> {
    let mut name = None;
    let mut krate: Option<Path> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("atomos")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                let lit: LitStr = meta.value()?.parse()?;
                if !valid_name(&lit.value()) {
                    return Err(syn::Error::new(
                        lit.span(),
                        "a stored name is dotted segments of ASCII letters, digits and `_`, \
                         such as \"inventory.Item\"",
                    ));
                }
                if name.replace(lit).is_some() {
                    return Err(meta.error("the stored name is given twice"));
                }
                Ok(())
            } else if meta.path.is_ident("crate") {
                let lit: LitStr = meta.value()?.parse()?;
                krate = Some(lit.parse()?);
                Ok(())
            } else {
                Err(meta.error("expected `name = \"...\"` or `crate = \"...\"`"))
            }
        })?;
    }
    let name = name.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "#[derive(Object)] needs the name values are stored under: \
             #[atomos(name = \"namespace.Type\")]",
        )
    })?;
    Ok(Attributes {
        name,
        krate: krate.unwrap_or_else(|| parse_quote!(::atomos)),
    })
}

/// The rule `StoredName::declared` checks, repeated here so that a bad name is reported at the
/// attribute rather than where the name is first used.
fn valid_name(name: &str) -> bool {
    name.len() <= 200
        && name.contains('.')
        && name
            .split('.')
            .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
}

fn expand(input: DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let Attributes { name, krate } = attributes(&input)?;
    let mut generics = input.generics.clone();
    let mut params = Vec::new();
    for param in &mut generics.params {
        match param {
            GenericParam::Type(t) => {
                t.bounds.push(parse_quote!(#krate::Object));
                let ident = &t.ident;
                params.push(quote!(<#ident as #krate::Object>::NAME));
            }
            GenericParam::Lifetime(l) => {
                return Err(syn::Error::new_spanned(
                    l,
                    "a stored type owns its data: it cannot borrow (no lifetime parameters)",
                ))
            }
            GenericParam::Const(c) => {
                return Err(syn::Error::new_spanned(
                    c,
                    "#[derive(Object)] does not name const parameters: implement `Object` by \
                     hand",
                ))
            }
        }
    }
    let ident = &input.ident;
    let (impl_generics, type_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics #krate::Object for #ident #type_generics #where_clause {
            const NAME: #krate::StoredName =
                #krate::StoredName::declared::<Self>(#name, &[#(#params),*]);
        }
    })
}
