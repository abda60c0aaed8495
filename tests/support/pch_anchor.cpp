// Anchor translation unit of the precompiled test header.
