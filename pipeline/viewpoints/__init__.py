"""The novel-viewpoint experiment: the `viewpoints` stage."""
