"""Mixed precision training

With the ``mixed_float16`` global policy, layers compute in float16 and keep their weights in
float32; ``compile`` wraps the optimizer in a ``LossScaleOptimizer`` that scales the loss to keep
small gradients from vanishing. As the mixed precision guide recommends, the final softmax runs
in float32 (``dtype="float32"``).

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, batch_size=64, epochs=5, validation_split=0.2)
    +mpi_trainer.fit(model, x_train, y_train, batch_size=64, epochs=5, validation_split=0.2)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
from keras import layers  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.mixed_precision.set_global_policy("mixed_float16")
keras.utils.set_random_seed(21)

digits = load_digits()
x = digits.data.astype("float32") / 16.0
x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=8)

inputs = keras.Input(shape=(64,), name="digits")
x = layers.Dense(128, activation="relu", name="dense_1")(inputs)
x = layers.Dense(128, activation="relu", name="dense_2")(x)
x = layers.Dense(10, name="dense_logits")(x)
outputs = layers.Activation("softmax", dtype="float32", name="predictions")(x)
model = keras.Model(inputs=inputs, outputs=outputs)
print("Compute dtype:", model.layers[1].compute_dtype, "variable dtype:", model.layers[1].variable_dtype)
print("Outputs dtype:", outputs.dtype)

model.compile(loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"])
print("Optimizer:", type(model.optimizer).__name__)

mpi_trainer.fit(model, x_train, y_train, batch_size=64, epochs=5, validation_split=0.2, verbose=2)

print("Optimizer iterations:", int(model.optimizer.iterations))
test_scores = model.evaluate(x_test, y_test, verbose=0)
print("Loss on the test set:", test_scores[0])
print("Test accuracy:", test_scores[1])
