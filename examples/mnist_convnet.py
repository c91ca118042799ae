"""Simple convnet on handwritten digits

A small convolutional network in the style of keras.io's "Simple MNIST convnet", trained on
scikit-learn's 8x8 handwritten digits kept as uint8 images like MNIST's. The script scales the
pixels to [0, 1] and adds the channel axis itself, one-hot encodes the labels for categorical
crossentropy, and holds back 10% of the training rows with ``validation_split``.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)
    +mpi_trainer.fit(model, x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(1337)

num_classes = 10
input_shape = (8, 8, 1)

# The digits as uint8 images, 0-255 like MNIST's (scikit-learn stores them as 0-16)
digits = load_digits()
images = np.minimum(digits.images * 16, 255).astype("uint8")
x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0)

# Scale images to the [0, 1] range and make sure they have shape (8, 8, 1)
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")

# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.3),
        layers.Dense(num_classes, activation="softmax"),
    ]
)
model.summary()

batch_size = 32
epochs = 4

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

mpi_trainer.fit(model, x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1, verbose=2)

score = model.evaluate(x_test, y_test, verbose=0)
print("Loss on the test set:", score[0])
print("Test accuracy:", score[1])
