# The tests' processes start TensorFlow without Keras (support/examples.py, skip_keras_at_import):
# with TF_USE_LEGACY_KERAS=1 TensorFlow imports tf_keras at start; this folder comes first on
# their PYTHONPATH, so that import fails at once and TensorFlow goes on without Keras. A run that
# needs Keras (an example's defaults, a Keras model) is given USERS_ENVIRONMENT instead.
raise ImportError("the tests' processes start TensorFlow without Keras: run with "
                  "support.examples.USERS_ENVIRONMENT to use it")
