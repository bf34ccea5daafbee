"""The named task pipelines, declared explicitly (imported only when used)."""
from seqapps.pipeline import REGISTRY

REGISTRY.declare("weather_forecasting", "pipelines.forecasting:WeatherForecasting",
                 "next 24 h of air temperature from past hourly weather (LSTM/GRU encoder)")
REGISTRY.declare("load_forecasting", "pipelines.forecasting:LoadForecasting",
                 "next day of electricity demand from past demand and calendar features")
