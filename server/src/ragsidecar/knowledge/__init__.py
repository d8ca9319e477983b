"""Knowledge runtime: reading sources into units and chunking them."""
