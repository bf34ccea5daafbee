"""What a run leaves to look at: TensorBoard logs and a self-contained ``report.html``.

``document`` holds the report's blocks and writes the HTML; ``plots`` draws the figures
(matplotlib, offline); ``run_folder`` owns the run folder (``runs/NAME/VERSION``): its files,
the test metrics and figures logged to TensorBoard, and the report built from what the run saved.
None of them imports Keras; only the TensorBoard writer imports TensorFlow.
"""
