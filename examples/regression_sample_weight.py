"""Regression with per-sample weights

A small regression network predicts disease progression from scikit-learn's diabetes data,
trained with the mean absolute error. ``sample_weight`` gives the patients with the most advanced
disease (the top quarter of the targets) twice the weight of the others in the training loss. The
held-out score is the plain, unweighted MAE.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, sample_weight=weights, epochs=20, batch_size=32)
    +mpi_trainer.fit(model, x_train, y_train, sample_weight=weights, epochs=20, batch_size=32)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_diabetes  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(0)

x, y = load_diabetes(return_X_y=True)  # the features are already centred and scaled
x_train, x_test, y_train, y_test = train_test_split(x.astype("float32"), y.astype("float32"), test_size=0.2,
                                                    random_state=13)
weights = np.where(y_train > np.quantile(y_train, 0.75), 2.0, 1.0).astype("float32")

model = keras.Sequential(
    [
        keras.Input(shape=(10,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(1, bias_initializer=keras.initializers.Constant(float(np.median(y_train)))),
    ]
)
model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mae", metrics=["mae"])
mpi_trainer.fit(model, x_train, y_train, sample_weight=weights, epochs=20, batch_size=32, verbose=0)

loss, mae = model.evaluate(x_test, y_test, verbose=0)
print(f"Test mae: {mae:.2f}")
