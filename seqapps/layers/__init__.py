"""Keras layers of seqapps."""
